"""The pipeline: jobs over a cluster's archive (``flotilla pipeline JOB``).

The pure parts (the key-value fold) need nothing beyond the node; the jobs themselves run on
Spark, installed by the ``pipeline`` extra (``pip install 'flotilla[pipeline]'``).
"""
