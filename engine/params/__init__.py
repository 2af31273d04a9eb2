"""What a request asks for: its sampling parameters, structured output (JSON schemas,
grammars and their compiled matchers), a thinking budget, and the defaults a model's
generation_config gives them."""
