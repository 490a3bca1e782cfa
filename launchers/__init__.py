"""Every command line and every process start: the campaign CLI (compare.py, campaign.py, the
`dlcompare` dispatcher cli.py), calibration, conformance checks, container images, and the
transports that place ranks on this machine, emulated nodes, ssh hosts or Slurm."""
