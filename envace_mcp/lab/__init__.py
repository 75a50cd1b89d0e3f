"""The lab: research tools beside the product (probes, training mixes, plots, campaign analyses). Tested, not the product."""
