"""Reports, plots, failure analysis and trace analysis of benchmark results and real-LLM traces."""
