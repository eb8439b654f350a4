"""The case studies (chapters 5 and 6; `looped case-studies` -> runs/analysis/FAMILY/case_studies.json):
truncated backpropagation and hyperconnections, refitted with the paper's protocol, and our paired
estimators of their change in phi with the law held at the main fit."""
