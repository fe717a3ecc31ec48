"""Data and evaluation: vocabulary, The Pile and Lambada readers, input pipelines, synthetic data."""
