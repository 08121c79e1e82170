"""What the tests share: starting etcd, daemons, rank groups and network-namespace hosts;
ports and sockets; the import graph of the packages. No test module imports another."""
