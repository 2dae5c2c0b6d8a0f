"""What `otel-titan export` writes: Chrome/Perfetto JSON and native Perfetto traces."""
