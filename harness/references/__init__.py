"""Reference engines (TransformerBridge, compatibility mode, HF) and their calibration: noise floors, tolerances, known reference bugs."""
