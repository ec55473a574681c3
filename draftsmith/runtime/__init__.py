"""The runtime: bind -> immutable DraftPlan; paging, Markov chain, acceptance, decoding loop,
targets. May import every layer below it."""
