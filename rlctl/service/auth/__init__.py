"""Who is calling: bearer tokens (RLCTL_API_TOKEN and the tokens file) and the scopes each route and tool needs.

docs/AUTH.md owns the rules.
"""
