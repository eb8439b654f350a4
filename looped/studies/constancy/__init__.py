"""Is phi a constant? (chapter 4, 04_constancy; `looped constancy` -> runs/analysis/FAMILY/constancy.json,
`looped misfit` -> runs/analysis/FAMILY/misfit.json): phi under other accountings and forms, where the law
misses against the pure error, phi under each r = 1 anchor, its drift with compute, and the law with
several phis."""
