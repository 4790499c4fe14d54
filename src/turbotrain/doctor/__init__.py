"""The doctor: why a training script is slow, where, and what each fix buys, measured."""
