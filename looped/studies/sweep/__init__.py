"""The design and the sweep (chapter 2 and appendices A-C; `looped sweep`, `looped runs`; records in
runs/STUDY/): the named studies as data, one study as a value, the resumable runner and what it
costs, the checks before a study runs, and what finished runs show before any law is fitted
(iso-FLOP minima, same-width gaps, the spread between replicates).  The other question packages
build on this one; it imports none of them."""
