"""`ft bench bw`: measured bandwidths of this machine's expert lanes, cached as a profile that `auto` mode reads."""
