"""Evidence: dated validation logs, their raw results, the one-off probes that produced findings, and the
plumbing of leased GPU hosts. The product never imports from here."""
