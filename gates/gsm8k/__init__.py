"""GSM8K accuracy gate: dataset, prompt recipes and extraction, async client, statistics, orchestration."""
