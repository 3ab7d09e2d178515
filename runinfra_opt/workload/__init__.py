"""Workloads: recorded traffic samples, read from JSONL/CSV/Parquet/OpenAI logs/ShareGPT and validated."""
