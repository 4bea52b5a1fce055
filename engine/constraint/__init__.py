"""Constrained generation: a turn's answer held to a grammar (a JSON schema, any JSON object, a regex, a Lark grammar).

llguidance (the parser llama.cpp and vLLM use) computes, before each token, the set of tokens the grammar allows;
the batcher masks the other logits of that row, so greedy and drawn tokens alike stay inside the grammar."""
