//! ZooKeeper-specific tests against a real server.
