"""The scale-across WAN: the user-space line (delay, loss, jitter) and ESP between buildings."""
