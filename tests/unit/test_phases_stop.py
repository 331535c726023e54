"""A stopped :class:`harness.phases.Phases` refuses new phases, its children too; and
:class:`harness.pipeline.overlap.Beside` stops the function it runs at that function's next phase."""
import threading

import pytest

from harness.phases import Phases, PhaseStopped
from harness.pipeline.overlap import Beside


def test_a_set_stop_refuses_the_next_phase_in_children_too_and_keeps_the_time_recorded():
    stop = threading.Event()
    phases = Phases().stoppable(stop)
    with phases("a"):
        pass
    stop.set()
    with pytest.raises(PhaseStopped, match="references.b"):
        with phases.child("references")("b"):
            pass
    assert list(phases.seconds) == ["a"]


def test_beside_stop_ends_its_function_at_the_next_phase_and_drops_what_it_raised():
    phases, entered, release = Phases(), [], threading.Event()

    def refs(stop):
        clock = phases.stoppable(stop)
        with clock("first"):
            entered.append("first")
            release.wait(5)
        with clock("second"):
            entered.append("second")

    beside = Beside(refs)
    while not entered:  # "first" has begun
        threading.Event().wait(0.01)
    beside.stop_event.set()
    release.set()
    beside.stop()
    assert entered == ["first"]

def test_beside_unstopped_returns_the_value():
    assert Beside(lambda stop: 7).result() == 7
