"""The one door for model files: training checkpoints read without Lightning, export folders
with their manifest of hashes, pinned pre-trained encoders, and hub ids written as such. One
policy for all of them (:mod:`docclass.artifacts.locate`): a missing path is an error, never a
download; a download is pinned to a commit; every file is checked against a hash; sizes are
checked before anything is allocated."""
