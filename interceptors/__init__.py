"""In/out interceptor chains and the spyne/zeep adapters."""
