"""The request filter chain: what a request looks like to a filter, the built-in filters, plugin loading."""
