"""Images in prompts: turning an image into the pixel values a vision encoder takes and
into the placeholder tokens its embeddings replace in the prompt (idefics3_images.py, for
SmolVLM / Idefics3)."""
