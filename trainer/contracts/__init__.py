"""What the daemon and the ranks both read or write, each contract in one torch-free module
that both sides import (DESIGN.md's layers let the daemon import this package): a name
spelled once cannot drift between its writer and its reader."""
