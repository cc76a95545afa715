"""Wire protocols, one module each (openai, ...): decode a target's responses into openai's types.

Protocols know nothing of routing or sockets.
"""
