"""The shared image store, by side: paths, client (the user's side), service
(the store account's side), local copies, prune, the verbs. Imports image/
and the ground floor."""
