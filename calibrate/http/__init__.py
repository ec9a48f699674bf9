"""HTTP to the server: the client, request bodies, responses, error kinds, stream timing, deadlines."""
