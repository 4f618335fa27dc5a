"""`berth build`: a Containerfile made into an image, unprivileged.

parse.py reads the file (BuildKit's own parser), plan.py makes its stages
and steps, context.py reads what COPY takes from the build context,
steps.py runs each step (RUN in Berth's own container), stepcache.py
keeps each step's result, output.py writes the image, verbs.py ties them.
"""
