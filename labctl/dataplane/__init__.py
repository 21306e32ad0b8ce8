"""The data plane beyond forwarding: traffic classes, ECN marking, PFC, and the controller that
drives them from queue depths (docs/design.md §3)."""
