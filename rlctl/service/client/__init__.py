"""`rlctl` client commands: the common API calls over HTTP, as tables for people or JSON for scripts."""
