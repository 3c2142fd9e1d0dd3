"""BERT-family pretraining (MLM, ELECTRA) and fine-tuning."""
