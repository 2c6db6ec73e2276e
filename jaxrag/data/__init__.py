"""Datasets: FlashRAG-style QA loaders and splits (qa.py), TFDS builders + grain pipelines (tfds_qa.py),
and the synthetic world (synthetic/)."""
from jaxrag.data.qa import QADataError, QAExample, load_qa, parse_select, select

__all__ = ["QADataError", "QAExample", "load_qa", "parse_select", "select"]
