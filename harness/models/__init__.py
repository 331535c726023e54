"""What is tested: model families (data), offline checkpoint building, targets, prompts."""
