"""`ft serve`: OpenAI and Anthropic HTTP APIs over the live engine, with a prefix cache and a start-up memory plan."""
