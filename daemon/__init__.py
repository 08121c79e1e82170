"""The per-node Phalanx supervisor. Never imports torch."""
