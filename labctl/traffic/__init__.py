"""RoCEv2 traffic: wire format, collective schedules, FSDP workloads, agents and reports."""
