"""What ships to the hosts in the service image: the gateway, the Redis queue and the workers."""
