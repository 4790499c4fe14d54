"""Stage 1, recording: run the user's script under hooks and keep what happened as a plain-data Recording.

The recorder (:mod:`.recorder`) wires the phase clock (:mod:`.clock`), the step boundaries (:mod:`.steps`),
the tallies the wrappers write (:mod:`.tallies`) and the wrappers themselves (:mod:`.instrument`,
:mod:`.discovery`), and ends in a :class:`~.recording.Recording`.
"""
