//! Training on candle: models, parameters, optimizers, losses, the step and
//! checkpoints.

mod bce;
mod bert;
pub mod best;
pub mod checkpoint;
mod class_weights;
mod cnn;
mod device;
mod distill;
pub mod dropout;
mod gpt;
pub mod ignored;
pub mod linear;
pub mod loss;
mod mlp;
pub mod model;
pub mod optim;
mod params;
pub mod precision;
pub mod prune;
pub mod recompute;
pub mod rng;
pub mod schedule;
mod trainer;
pub mod warm_start;
mod workers;

pub use bert::{Bert, Family};
pub use cnn::{max_pool_2x2, Cnn};
pub use device::{describe as describe_device, parse_device};
pub use gpt::Gpt;
pub use mlp::{Activation, Mlp};
pub use model::{Draw, ModelSpec, TrainModule};
pub use params::ParamStore;
pub use trainer::{
    ClassScores, Eval, EvalSums, Grads, LossSum, PerClass, Ready, Regression, TargetScores,
    Trainer, TrainerOptions, MAX_CONFUSION_CLASSES,
};
pub use workers::run_on_workers;
