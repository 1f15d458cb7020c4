//! A regression's evaluation: each target's running sums and its RMSE,
//! MAE and R², as scikit-learn's metrics give them.

/// One regression target's running sums, in the model's units: the
/// errors' squares and absolute values, and the targets' sum and sum of
/// squares (for R²).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TargetSums {
    pub squared: f64,
    pub absolute: f64,
    pub sum: f64,
    pub squares: f64,
}

impl TargetSums {
    pub(super) fn add(&mut self, o: &TargetSums) {
        self.squared += o.squared;
        self.absolute += o.absolute;
        self.sum += o.sum;
        self.squares += o.squares;
    }

    /// The scores of `n` values.
    pub(super) fn scores(&self, n: f64) -> TargetScores {
        // The targets' spread about their mean: R² compares the errors with
        // predicting that mean (scikit-learn's r2_score).
        let spread = self.squares - self.sum * self.sum / n;
        TargetScores {
            rmse: (self.squared / n).sqrt(),
            mae: self.absolute / n,
            r2: match spread > 0.0 {
                true => 1.0 - self.squared / spread,
                false => f64::NAN,
            },
        }
    }
}

/// A regression target's evaluation: root mean squared error and mean
/// absolute error (in the model's units, until [`Regression::in_units`]),
/// and the coefficient of determination R² (which has none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TargetScores {
    pub rmse: f64,
    pub mae: f64,
    pub r2: f64,
}

/// A regression's evaluation, target by target (one for a single target).
#[derive(Debug, Clone, PartialEq)]
pub struct Regression {
    pub targets: Vec<TargetScores>,
}

impl Regression {
    /// The errors in the targets' units, for a model that predicts each
    /// target standardized, `(value - mean) / std` (a target without a
    /// deviation in `std` keeps its errors).
    pub fn in_units(self, std: &[f64]) -> Regression {
        let targets = self.targets.iter().enumerate().map(|(k, t)| {
            let s = std.get(k).copied().unwrap_or(1.0);
            TargetScores {
                rmse: t.rmse * s,
                mae: t.mae * s,
                r2: t.r2,
            }
        });
        Regression {
            targets: targets.collect(),
        }
    }

    /// The mean over the targets of `score`, as scikit-learn's metrics
    /// average several outputs (`multioutput="uniform_average"`); for one
    /// target, its own.
    fn mean(&self, score: impl Fn(&TargetScores) -> f64) -> f64 {
        self.targets.iter().map(score).sum::<f64>() / self.targets.len().max(1) as f64
    }

    /// The root mean squared error (the mean of the targets').
    pub fn rmse(&self) -> f64 {
        self.mean(|t| t.rmse)
    }

    /// The mean absolute error (the mean of the targets').
    pub fn mae(&self) -> f64 {
        self.mean(|t| t.mae)
    }

    /// R² (the mean of the targets').
    pub fn r2(&self) -> f64 {
        self.mean(|t| t.r2)
    }
}
