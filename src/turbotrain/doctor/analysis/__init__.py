"""Stage 2, analysis: a Recording read into the Context the rules see (breakdown, periodic work, the machine,
python overhead, the user's sources)."""
