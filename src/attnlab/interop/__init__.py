"""Published checkpoint formats <-> attnlab's models: Hugging Face BERT directories
(``hf_bert``) and GPT-2 (``hf_gpt2``)."""
