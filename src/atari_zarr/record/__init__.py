"""Recording new Atari play into stores: environments and the collector."""
