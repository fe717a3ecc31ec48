"""Data and evaluation: tokenizers, the registered datasets (synthetic, the sample corpus, The Pile, your own text files, BoolQ) and Lambada, their readers and input pipelines."""
