"""What phi is on our runs (chapter 3: 03_fit, 03_our_phi, 03_phi_limits; the fit itself is the
core's `looped fit`): every estimate of phi beside the paper's, how firmly the runs pin it, and the
scorecard of a finished study."""
