"""Another lab's runs (appendix D, appendix_external; `looped external` ->
runs/analysis/external.json): the qlabs scaling-exponents tables read as our runs table, and phi on
them."""
