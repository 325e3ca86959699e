"""What happens inside llama.cpp: hooks, events, timeline, node costs."""
