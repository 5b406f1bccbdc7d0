"""Adasum computed in NumPy, as the tests' reference: the pairwise
combination and Horovod's binary tree over the ranks."""


def combine(a, b):
    """a (+) b = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b (a zero vector
    keeps its partner as it is)."""
    dot, a2, b2 = float(a @ b), float(a @ a), float(b @ b)
    ca = 1 - dot / (2 * a2) if a2 > 0 else 1.0
    cb = 1 - dot / (2 * b2) if b2 > 0 else 1.0
    return ca * a + cb * b


def tree(vectors):
    """Adasum over ranks 0..n-1: the lower half's result (+) the upper half's."""
    if len(vectors) == 1:
        return vectors[0]
    half = len(vectors) // 2
    return combine(tree(vectors[:half]), tree(vectors[half:]))
