import sys
import unittest

sys.path.insert(0, "/app")
from stats import median  # noqa: E402


class MedianTest(unittest.TestCase):
    def test_odd_length(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_even_length_is_mean_of_middle_values(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_single_value(self):
        self.assertEqual(median([7]), 7)

    def test_input_is_not_mutated(self):
        values = [3, 1, 2]
        median(values)
        self.assertEqual(values, [3, 1, 2])


if __name__ == "__main__":
    unittest.main()
