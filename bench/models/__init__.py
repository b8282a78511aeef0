"""The models (GPT, Llama, Hugging Face configs): their description, build and data."""
