//! What a resumed run is told about how it differs from its checkpoint,
//! besides the learning rate (`Run::resume`), and the differences it is
//! refused for: data of other classes, table data of other inputs or
//! targets.

/// Whether the data's class names (`data`) are those the checkpoint's model
/// learned (`saved`), when both are known: a renamed class folder would
/// make its labels mean other classes. Bad input (exit 2): the checkpoint
/// itself is sound.
pub(super) fn same_classes(
    path: &std::path::Path,
    saved: Option<&[String]>,
    data: Option<&[String]>,
) -> crate::Result<()> {
    let (Some(saved), Some(data)) = (saved, data) else {
        return Ok(());
    };
    match crate::data::class_difference(("the checkpoint's", saved), ("the data's", data)) {
        None => Ok(()),
        Some(why) => Err(crate::Error::Data(format!(
            "resuming {}: {why}; its model's outputs are the checkpoint's classes, so training on this data would teach it other ones. Resume with the data it was trained on, or label this data by the checkpoint's classes (taper.data.images{{ classes = {{...}} }})",
            path.display()
        ))),
    }
}

/// Whether the data gives the checkpoint's model the inputs it learned
/// (`saved`), for table data: a column of categories read with other
/// categories (the file gained one) would move them; and a regression's
/// targets in its order: each output learned one. Bad input (exit 2).
pub(super) fn same_inputs(
    path: &std::path::Path,
    saved: Option<&crate::data::TableInput>,
    data: Option<&crate::data::TableInput>,
) -> crate::Result<()> {
    let (Some(saved), Some(data)) = (saved, data) else {
        return Ok(());
    };
    if let Some(why) =
        crate::data::input_difference(("the checkpoint's", saved), ("the data's", data))
    {
        return Err(crate::Error::Data(format!(
            "resuming {}: {why}; its model learned the checkpoint's inputs. Resume with the data it was trained on, or give the checkpoint's categories: taper.data.csv{{ categorical = {{ column = {{...}} }} }}",
            path.display()
        )));
    }
    match crate::data::target_difference(("the checkpoint's", saved), ("the data's", data)) {
        None => Ok(()),
        Some(why) => Err(crate::Error::Data(format!(
            "resuming {}: {why}; each of its model's outputs learned one of the checkpoint's targets, in its order. Resume with the data it was trained on, its `target` in that order",
            path.display()
        ))),
    }
}

/// What a resume under another optimizer means, from the two descriptions
/// (`adamw lr 0.001 betas (0.9, 0.999) ...`; the learning rate has its own
/// note): another kind starts its state afresh, the same kind with other
/// settings takes the recipe's. None when only the learning rate differs.
pub(super) fn optimizer_note(saved: &str, recipe: &str) -> Option<String> {
    fn without_lr(s: &str) -> Vec<&str> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < words.len() {
            if words[i] == "lr" {
                i += 2;
                continue;
            }
            out.push(words[i]);
            i += 1;
        }
        out
    }
    let (a, b) = (without_lr(saved), without_lr(recipe));
    if saved.is_empty() || a == b {
        return None;
    }
    Some(if a.first() != b.first() {
        format!(
            "note: the checkpoint's optimizer is `{saved}`, the recipe's `{recipe}`: its state starts afresh"
        )
    } else {
        format!("note: the recipe's optimizer `{recipe}` replaces the checkpoint's `{saved}`; its state carries over")
    })
}

#[cfg(test)]
mod optimizer_note_tests {
    use super::optimizer_note;

    #[test]
    fn another_optimizer_or_its_settings_are_noted_but_not_the_lr() {
        let adamw = |lr: f64, wd: f64| {
            format!("adamw lr {lr} betas (0.9, 0.999) eps 0.00000001 weight_decay {wd}")
        };
        assert_eq!(optimizer_note(&adamw(1e-3, 0.01), &adamw(5e-4, 0.01)), None);
        assert_eq!(optimizer_note("", &adamw(1e-3, 0.01)), None);
        let n = optimizer_note(&adamw(1e-3, 0.01), &adamw(1e-3, 0.5)).unwrap();
        assert!(
            n.contains("weight_decay 0.5` replaces") && n.contains("carries over"),
            "{n}"
        );
        let n =
            optimizer_note(&adamw(1e-3, 0.01), "sgd lr 0.01 momentum 0 weight_decay 0").unwrap();
        assert!(n.contains("starts afresh"), "{n}");
        let n = optimizer_note(&adamw(1e-3, 0.01), &(adamw(1e-3, 0.01) + " state 8bit")).unwrap();
        assert!(n.contains("state 8bit` replaces"), "{n}");
    }
}
