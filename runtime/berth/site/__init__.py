"""What the site runs for users: EDFs, the prolog's `setup-user`. Imports
container/, store/, image/ and the ground floor."""
