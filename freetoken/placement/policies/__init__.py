"""The built-in placement policies, one file each (the sweep family a subpackage): the readable reference class
first, then under one banner its compiled half over a named State (freetoken/placement/compiled). Registered by name
in freetoken.placement.POLICIES; docs/policies.md adds one."""
