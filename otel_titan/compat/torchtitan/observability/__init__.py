"""otel-titan's stand-in for ``torchtitan.observability`` (`otel_titan.compat.torchtitan.install`
puts it there)."""
