"""``ddptui join``: the front end one more node of a multi-node run runs."""
