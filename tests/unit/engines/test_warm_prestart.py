"""harness.engines.warm.prestart: the server starts ahead of the first engine and that engine uses it;
a prestart that failed is replaced; nothing starts where warm starts are off.  A stand-in server class
(the real one imports vLLM for 10-16 s: tests/engine/test_engine_kill.py runs engines through it)."""
from __future__ import annotations

import pytest

from harness.engines import warm


class FakeServer:
    started: list["FakeServer"] = []

    def __init__(self, ok: bool = True) -> None:
        self.ok, self.dead, self.waits = ok, False, 0
        FakeServer.started.append(self)

    @property
    def gone(self) -> bool:
        return self.dead

    def wait_ready(self) -> bool:
        self.waits += 1
        if not self.ok:
            self.dead = True
        return self.ok


@pytest.fixture
def fake(monkeypatch):
    FakeServer.started = []
    monkeypatch.setattr(warm, "_Server", FakeServer)
    monkeypatch.setattr(warm, "_server", None)
    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    monkeypatch.setattr(warm.sys, "platform", "linux")
    return FakeServer


def test_prestart_starts_the_server_without_waiting_and_the_first_engine_uses_it(fake):
    warm.prestart()
    (server,) = fake.started
    assert server.waits == 0  # its imports run while the caller goes on
    assert warm._get_server() is server and server.waits == 1
    warm.prestart()  # one is running: no second
    assert fake.started == [server]


def test_a_prestarted_server_that_failed_is_replaced_at_the_first_engine(fake):
    warm.prestart()
    fake.started[0].ok = False
    server = warm._get_server()
    assert len(fake.started) == 2 and server is fake.started[1]


def test_nothing_starts_where_warm_starts_are_off(fake, monkeypatch):
    monkeypatch.setenv(warm.WARM_ENV, "0")
    warm.prestart()
    assert fake.started == [] and warm._server is None
